! An "MPI" Fortran runner without MPI, for tests/native/test_native_slices.py: the OpenMP threads of one
! process are the ranks of one runner (each its own handle), their collectives bind(c) functions on OpenMP
! barriers passed with enkflow_set_comm. Rank r holds an uneven slice of the ring field x (40 real(8)) of
! tests/online/test_online_bad_input.py, bound as a section of the shared array; rank 0 runs the ring model
! on the whole array between exposes.  Usage: OMP_NUM_THREADS=N omp_slices_runner ADDRESS TOKEN [tcp]
! (tcp: enkflow_set_transport(ENKFLOW_TRANSPORT_TCP); else the default, shared memory where it can)
module omp_comm
  use, intrinsic :: iso_c_binding
  implicit none
  type(c_ptr), save :: src = c_null_ptr
  integer(c_int), save :: vals(0:63)
  integer, save :: nranks = 1
contains
  integer(c_int) function bcast(buf, nbytes, ctx) bind(c)
    type(c_ptr), value :: buf, ctx
    integer(c_size_t), value :: nbytes
    integer(c_int), pointer :: rank
    integer(c_int8_t), pointer :: from(:), to(:)
    call c_f_pointer(ctx, rank)
    if (rank == 0) src = buf
    !$omp barrier
    if (rank /= 0 .and. nbytes > 0) then
      call c_f_pointer(src, from, [nbytes])
      call c_f_pointer(buf, to, [nbytes])
      to = from
    end if
    !$omp barrier
    bcast = 0
  end function bcast

  integer(c_int) function allmax(value, ctx) bind(c)
    integer(c_int), intent(inout) :: value
    type(c_ptr), value :: ctx
    integer(c_int), pointer :: rank
    integer(c_int) :: m
    call c_f_pointer(ctx, rank)
    vals(rank) = value
    !$omp barrier
    m = maxval(vals(0:nranks - 1))
    !$omp barrier
    value = m
    allmax = 0
  end function allmax
end module omp_comm

program omp_slices_runner
  use, intrinsic :: iso_c_binding
  use omp_lib
  use omp_comm
  use enkflow_runner_mod
  implicit none
  integer, parameter :: n = 40
  real(8), target :: x(n)
  character(len=256) :: address, token, transport
  integer :: failed = 0

  call get_command_argument(1, address)
  call get_command_argument(2, token)
  call get_command_argument(3, transport)
  x = 0
  !$omp parallel default(shared)
  call serve()
  !$omp end parallel
  if (failed /= 0) stop 1

contains

  subroutine serve()
    integer(c_int), target :: rank
    type(enkflow_runner) :: r
    integer :: ierr, lo, hi
    integer(c_int64_t) :: nsteps
    rank = omp_get_thread_num()
    !$omp single
    nranks = omp_get_num_threads()
    !$omp end single
    lo = (n * rank) / nranks / 2           ! uneven: rank k of P holds [40k/2P, 40(k+1)/2P), the last the rest
    hi = (n * (rank + 1)) / nranks / 2
    if (rank == nranks - 1) hi = n
    call enkflow_create(r, trim(address), trim(token), ierr)
    if (ierr == ENKFLOW_OK) call enkflow_set_timeouts(r, 20d0, 5d0, ierr)
    if (ierr == ENKFLOW_OK .and. transport == 'tcp') call enkflow_set_transport(r, ENKFLOW_TRANSPORT_TCP, ierr)
    if (ierr == ENKFLOW_OK) call enkflow_set_comm(r, int(rank), nranks, c_funloc(bcast), c_funloc(allmax), c_loc(rank), ierr)
    if (ierr == ENKFLOW_OK) call enkflow_add_field(r, 'x', ENKFLOW_FLOAT64, [n], .true., ierr)
    if (ierr == ENKFLOW_OK) call enkflow_set_slice(r, 'x', int(lo, c_int64_t), int(hi - lo, c_int64_t), ierr)
    if (ierr == ENKFLOW_OK) call enkflow_init(r, ierr)
    if (ierr == ENKFLOW_OK) print '(a, i0, a, i0, a)', 'rank ', rank, ': shared memory with ', enkflow_shm_ranks(r), &
                                  ' server rank(s)'
    if (ierr == ENKFLOW_OK) call enkflow_bind(r, 'x', x(lo + 1:hi), ierr)
    if (ierr == ENKFLOW_OK) call enkflow_expose(r, nsteps, ierr)
    do while (ierr == ENKFLOW_OK .and. nsteps > 0)
      !$omp barrier
      if (rank == 0) call ring(nsteps, enkflow_cycle(r))
      !$omp barrier
      call enkflow_expose(r, nsteps, ierr)
    end do
    if (ierr /= ENKFLOW_OK) then
      write (0, '(a, i0, a)') 'rank ', rank, ': ' // enkflow_strerror(ierr) // ': ' // enkflow_errmsg(r)
      !$omp atomic
      failed = failed + 1
    end if
    call enkflow_finalize(r, ierr)
  end subroutine serve

  subroutine ring(nsteps, cycle)
    integer(c_int64_t), intent(in) :: nsteps, cycle
    real(8) :: y(n)
    integer(c_int64_t) :: s
    integer :: i
    do s = 1, nsteps
      do i = 1, n
        y(i) = x(i) + 0.2d0 * ((x(modulo(i - 2, n) + 1) - 2 * x(i)) + x(modulo(i, n) + 1))
      end do
      x = y + 0.01d0 * real(cycle, 8)
    end do
  end subroutine ring
end program omp_slices_runner
