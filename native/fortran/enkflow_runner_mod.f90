! enkflow_runner_mod: the Fortran interface of libenkflow_runner (enkflow's online-mode runner), over
! iso_c_binding. See docs/native.md.
!
!   use enkflow_runner_mod
!   type(enkflow_runner) :: r
!   real(8), allocatable, target :: x(:, :)            ! (nx, ny): any rank, contiguous, TARGET
!   integer(8) :: nsteps
!   call enkflow_create(r, address, token, ierr)
!   call enkflow_add_field(r, "x", ENKFLOW_FLOAT64, shape(x), .true., ierr)   ! Fortran-order extents
!   call enkflow_init(r, ierr)
!   call enkflow_bind(r, "x", x, ierr)                  ! generic: real(4), real(8), integer(4), integer(8)
!   call enkflow_expose(r, nsteps, ierr)
!   do while (ierr == ENKFLOW_OK .and. nsteps > 0)
!     ... advance x by nsteps; enkflow_member(r), enkflow_cycle(r) say which member and cycle ...
!     call enkflow_expose(r, nsteps, ierr)
!   end do
!   if (ierr /= ENKFLOW_OK) print *, enkflow_errmsg(r)
!   call enkflow_finalize(r, ierr)
!
! Shapes are given in Fortran (column-major) order and declared to the server reversed, in C order, so
! that the server's row-major field and the Fortran array have the same memory layout: a netCDF
! variable (lat, lon) read by the Fortran netCDF API as x(lon, lat) is declared with shape(x).
! A non-contiguous array section is refused by enkflow_bind (ENKFLOW_EINVAL).
! Every routine returns its error code in ierr (ENKFLOW_OK = 0); enkflow_errmsg(r) gives the detail.
! Nothing here stops the program.
!
! Model output through the study's output service (enkflow_output.h):
!   type(enkflow_output) :: o
!   call enkflow_output_open(o, output_address, output_token_file, ierr)
!   call enkflow_output_add(o, 'sst', x, hour, ierr, member=m, start=[i0, j0])   ! real(4)/real(8), any rank
!   call enkflow_output_close(o, ierr)                                           ! waits until written
!   if (ierr /= ENKFLOW_OK) print *, enkflow_output_errmsg(o)
!   call enkflow_output_free(o)
! The field's dims in [output] are in C order, the Fortran array's reversed (as for enkflow_add_field);
! start: the 1-based index in the field of x's first element per Fortran dimension (absent: the whole field).
module enkflow_runner_mod
  use, intrinsic :: iso_c_binding
  implicit none
  private

  integer, parameter, public :: ENKFLOW_FLOAT32 = 1, ENKFLOW_FLOAT64 = 2, ENKFLOW_INT32 = 3, ENKFLOW_INT64 = 4
  integer, parameter, public :: ENKFLOW_OK = 0, ENKFLOW_EINVAL = 1, ENKFLOW_ESTATE = 2, ENKFLOW_ENOMEM = 3, &
                                ENKFLOW_EFIELD = 4, ENKFLOW_ETYPE = 5, ENKFLOW_ESIZE = 6, ENKFLOW_EREFUSED = 7, &
                                ENKFLOW_ELOST = 8, ENKFLOW_EPROTOCOL = 9, ENKFLOW_EZMQ = 10, ENKFLOW_EIO = 11, &
                                ENKFLOW_EINTR = 12, ENKFLOW_EOUTPUT = 13
  !> enkflow_set_transport: shared memory with the server ranks on this node (else TCP), with all, or none.
  integer, parameter, public :: ENKFLOW_TRANSPORT_AUTO = 0, ENKFLOW_TRANSPORT_SHM = 1, ENKFLOW_TRANSPORT_TCP = 2

  type, public :: enkflow_runner
    type(c_ptr) :: ptr = c_null_ptr
  end type enkflow_runner

  !> A client of the study's output service (enkflow_output.h).
  type, public :: enkflow_output
    type(c_ptr) :: ptr = c_null_ptr
  end type enkflow_output

  !> enkflow_output_stats of C: pieces added, their bytes, seconds in add, of them waiting (back-pressure).
  type, public, bind(c) :: enkflow_output_stats
    integer(c_int64_t) :: adds = 0, bytes = 0
    real(c_double) :: add_s = 0, blocked_s = 0
  end type enkflow_output_stats

  public :: enkflow_create, enkflow_set_timeouts, enkflow_set_name, enkflow_set_curve_key, enkflow_add_field, &
            enkflow_set_transport, enkflow_shm_ranks, &
            enkflow_set_slice, enkflow_set_comm, enkflow_init, enkflow_bind, enkflow_expose, enkflow_fail, enkflow_finalize, &
            enkflow_errmsg, enkflow_strerror, enkflow_member, enkflow_cycle, enkflow_nsteps, enkflow_read_token_file
  public :: enkflow_output_open, enkflow_output_open_dir, enkflow_output_set_timeout, enkflow_output_add, &
            enkflow_output_sync, enkflow_output_discard, enkflow_output_dropped, enkflow_output_close, enkflow_output_free, &
            enkflow_output_errmsg, enkflow_output_get_stats, enkflow_output_service_stats, enkflow_output_members

  interface enkflow_output_add
    module procedure output_add_r4, output_add_r8
  end interface enkflow_output_add

  interface enkflow_add_field
    module procedure add_field_i4, add_field_i8
  end interface enkflow_add_field

  interface enkflow_bind
    module procedure bind_r4, bind_r8, bind_i4, bind_i8
  end interface enkflow_bind

  interface
    integer(c_int) function c_create(out, address, token) bind(c, name="enkflow_runner_create")
      import :: c_int, c_ptr, c_char
      type(c_ptr), intent(out) :: out
      character(kind=c_char), intent(in) :: address(*), token(*)
    end function
    integer(c_int) function c_set_timeouts(r, timeout_s, reconnect_s) bind(c, name="enkflow_runner_set_timeouts")
      import :: c_int, c_ptr, c_double
      type(c_ptr), value :: r
      real(c_double), value :: timeout_s, reconnect_s
    end function
    integer(c_int) function c_set_name(r, name) bind(c, name="enkflow_runner_set_name")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: r
      character(kind=c_char), intent(in) :: name(*)
    end function
    integer(c_int) function c_set_curve_key(r, key) bind(c, name="enkflow_runner_set_curve_key")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: r
      character(kind=c_char), intent(in) :: key(*)
    end function
    integer(c_int) function c_add_field(r, name, dtype, ndim, shape, assimilated) bind(c, name="enkflow_runner_add_field")
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: r
      character(kind=c_char), intent(in) :: name(*)
      integer(c_int), value :: dtype, ndim, assimilated
      integer(c_int64_t), intent(in) :: shape(*)
    end function
    integer(c_int) function c_set_slice(r, name, offset, count) bind(c, name="enkflow_runner_set_slice")
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: r
      character(kind=c_char), intent(in) :: name(*)
      integer(c_int64_t), value :: offset, count
    end function
    integer(c_int) function c_set_comm(r, rank, size, bcast, allmax, ctx) bind(c, name="enkflow_runner_set_comm")
      import :: c_int, c_ptr, c_funptr
      type(c_ptr), value :: r, ctx
      integer(c_int), value :: rank, size
      type(c_funptr), value :: bcast, allmax
    end function
    integer(c_int) function c_init(r) bind(c, name="enkflow_runner_init")
      import :: c_int, c_ptr
      type(c_ptr), value :: r
    end function
    integer(c_int) function c_bind(r, name, dtype, data, count) bind(c, name="enkflow_runner_bind")
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: r, data
      character(kind=c_char), intent(in) :: name(*)
      integer(c_int), value :: dtype
      integer(c_int64_t), value :: count
    end function
    integer(c_int) function c_set_error(r, code, message) bind(c, name="enkflow_runner_set_error")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: r
      integer(c_int), value :: code
      character(kind=c_char), intent(in) :: message(*)
    end function
    integer(c_int) function c_expose(r, nsteps) bind(c, name="enkflow_runner_expose")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: r
      integer(c_int64_t), intent(out) :: nsteps
    end function
    integer(c_int) function c_fail(r, error) bind(c, name="enkflow_runner_fail")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: r
      character(kind=c_char), intent(in) :: error(*)
    end function
    integer(c_int) function c_finalize(r) bind(c, name="enkflow_runner_finalize")
      import :: c_int, c_ptr
      type(c_ptr), value :: r
    end function
    integer(c_int64_t) function c_member(r) bind(c, name="enkflow_runner_member")
      import :: c_int64_t, c_ptr
      type(c_ptr), value :: r
    end function
    integer(c_int64_t) function c_cycle(r) bind(c, name="enkflow_runner_cycle")
      import :: c_int64_t, c_ptr
      type(c_ptr), value :: r
    end function
    integer(c_int) function c_set_transport(r, transport) bind(c, name="enkflow_runner_set_transport")
      import :: c_int, c_ptr
      type(c_ptr), value :: r
      integer(c_int), value :: transport
    end function
    integer(c_int) function c_shm_ranks(r) bind(c, name="enkflow_runner_shm_ranks")
      import :: c_int, c_ptr
      type(c_ptr), value :: r
    end function
    integer(c_int64_t) function c_nsteps(r) bind(c, name="enkflow_runner_nsteps")
      import :: c_int64_t, c_ptr
      type(c_ptr), value :: r
    end function
    type(c_ptr) function c_errmsg(r) bind(c, name="enkflow_runner_errmsg")
      import :: c_ptr
      type(c_ptr), value :: r
    end function
    type(c_ptr) function c_strerror(code) bind(c, name="enkflow_strerror")
      import :: c_ptr, c_int
      integer(c_int), value :: code
    end function
    integer(c_int) function c_read_token_file(path, buf, size, errbuf, errsize) bind(c, name="enkflow_read_token_file")
      import :: c_int, c_char, c_size_t
      character(kind=c_char), intent(in) :: path(*)
      character(kind=c_char), intent(out) :: buf(*), errbuf(*)
      integer(c_size_t), value :: size, errsize
    end function
    integer(c_int) function c_out_open(out, address, token_file, timeout_s) bind(c, name="enkflow_output_open")
      import :: c_int, c_ptr, c_char, c_double
      type(c_ptr), intent(out) :: out
      character(kind=c_char), intent(in) :: address(*), token_file(*)
      real(c_double), value :: timeout_s
    end function
    integer(c_int) function c_out_open_dir(out, directory, timeout_s) bind(c, name="enkflow_output_open_dir")
      import :: c_int, c_ptr, c_char, c_double
      type(c_ptr), intent(out) :: out
      character(kind=c_char), intent(in) :: directory(*)
      real(c_double), value :: timeout_s
    end function
    integer(c_int) function c_out_set_timeout(o, timeout_s) bind(c, name="enkflow_output_set_timeout")
      import :: c_int, c_ptr, c_double
      type(c_ptr), value :: o
      real(c_double), value :: timeout_s
    end function
    integer(c_int) function c_out_add(o, name, dtype, data, ndim, shape, time, member, region) &
        bind(c, name="enkflow_output_add")
      import :: c_int, c_ptr, c_char, c_int64_t, c_double
      type(c_ptr), value :: o, data, region
      character(kind=c_char), intent(in) :: name(*)
      integer(c_int), value :: dtype, ndim
      integer(c_int64_t), intent(in) :: shape(*)
      real(c_double), value :: time
      integer(c_int64_t), value :: member
    end function
    integer(c_int) function c_out_sync(o) bind(c, name="enkflow_output_sync")
      import :: c_int, c_ptr
      type(c_ptr), value :: o
    end function
    integer(c_int) function c_out_discard(o, time, ndropped) bind(c, name="enkflow_output_discard")
      import :: c_int, c_ptr, c_double, c_int64_t
      type(c_ptr), value :: o
      real(c_double), value :: time
      integer(c_int64_t), intent(out) :: ndropped
    end function
    type(c_ptr) function c_out_dropped(o) bind(c, name="enkflow_output_dropped")
      import :: c_ptr
      type(c_ptr), value :: o
    end function
    integer(c_int) function c_out_close(o, wait) bind(c, name="enkflow_output_close")
      import :: c_int, c_ptr
      type(c_ptr), value :: o
      integer(c_int), value :: wait
    end function
    subroutine c_out_free(o) bind(c, name="enkflow_output_free")
      import :: c_ptr
      type(c_ptr), value :: o
    end subroutine
    type(c_ptr) function c_out_errmsg(o) bind(c, name="enkflow_output_errmsg")
      import :: c_ptr
      type(c_ptr), value :: o
    end function
    integer(c_int) function c_out_set_error(o, code, message) bind(c, name="enkflow_output_set_error")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: o
      integer(c_int), value :: code
      character(kind=c_char), intent(in) :: message(*)
    end function
    integer(c_int) function c_out_get_stats(o, stats) bind(c, name="enkflow_output_get_stats")
      import :: c_int, c_ptr, enkflow_output_stats
      type(c_ptr), value :: o
      type(enkflow_output_stats), intent(out) :: stats
    end function
    type(c_ptr) function c_out_service_stats(o) bind(c, name="enkflow_output_service_stats")
      import :: c_ptr
      type(c_ptr), value :: o
    end function
    integer(c_int64_t) function c_out_members(o) bind(c, name="enkflow_output_members")
      import :: c_int64_t, c_ptr
      type(c_ptr), value :: o
    end function
    integer(c_size_t) function c_strlen(s) bind(c, name="strlen")
      import :: c_size_t, c_ptr
      type(c_ptr), value :: s
    end function
  end interface

contains

  function cstr(s) result(c)
    character(len=*), intent(in) :: s
    character(kind=c_char, len=len_trim(s) + 1) :: c
    c = trim(s) // c_null_char
  end function cstr

  function fstr(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: n, k
    if (.not. c_associated(p)) then
      s = ''
      return
    end if
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: s)
    do k = 1, n
      s(k:k) = chars(k)
    end do
  end function fstr

  !> A new runner for the server's control address (tcp://HOST:PORT) and the shared token.
  subroutine enkflow_create(r, address, token, ierr)
    type(enkflow_runner), intent(out) :: r
    character(len=*), intent(in) :: address, token
    integer, intent(out) :: ierr
    ierr = c_create(r%ptr, cstr(address), cstr(token))
  end subroutine enkflow_create

  !> Read a token file (EXPDIR/online/token) into token, whitespace stripped; msg gets the reason of an error.
  subroutine enkflow_read_token_file(path, token, ierr, msg)
    character(len=*), intent(in) :: path
    character(len=:), allocatable, intent(out) :: token
    integer, intent(out) :: ierr
    character(len=:), allocatable, intent(out), optional :: msg
    character(kind=c_char) :: buf(4096), err(1024)
    integer :: n
    buf = c_null_char
    err = c_null_char
    ierr = c_read_token_file(cstr(path), buf, int(size(buf), c_size_t), err, int(size(err), c_size_t))
    n = 0
    do while (n < size(buf))
      if (buf(n + 1) == c_null_char) exit
      n = n + 1
    end do
    allocate(character(len=n) :: token)
    token = transfer(buf(1:n), token)
    if (present(msg)) then
      n = 0
      do while (n < size(err))
        if (err(n + 1) == c_null_char) exit
        n = n + 1
      end do
      allocate(character(len=n) :: msg)
      msg = transfer(err(1:n), msg)
    end if
  end subroutine enkflow_read_token_file

  subroutine enkflow_set_timeouts(r, timeout_s, reconnect_s, ierr)
    type(enkflow_runner), intent(in) :: r
    real(8), intent(in) :: timeout_s, reconnect_s
    integer, intent(out) :: ierr
    ierr = c_set_timeouts(r%ptr, real(timeout_s, c_double), real(reconnect_s, c_double))
  end subroutine enkflow_set_timeouts

  subroutine enkflow_set_name(r, name, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: name
    integer, intent(out) :: ierr
    ierr = c_set_name(r%ptr, cstr(name))
  end subroutine enkflow_set_name

  subroutine enkflow_set_curve_key(r, key, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: key
    integer, intent(out) :: ierr
    ierr = c_set_curve_key(r%ptr, cstr(key))
  end subroutine enkflow_set_curve_key

  !> Before init: ENKFLOW_TRANSPORT_AUTO, _SHM or _TCP (without it: the environment's ENKFLOW_TRANSPORT, else auto).
  subroutine enkflow_set_transport(r, transport, ierr)
    type(enkflow_runner), intent(in) :: r
    integer, intent(in) :: transport
    integer, intent(out) :: ierr
    ierr = c_set_transport(r%ptr, int(transport, c_int))
  end subroutine enkflow_set_transport

  !> After init: how many server ranks this runner rank exchanges with through shared memory.
  integer function enkflow_shm_ranks(r)
    type(enkflow_runner), intent(in) :: r
    enkflow_shm_ranks = int(c_shm_ranks(r%ptr))
  end function enkflow_shm_ranks

  subroutine add_field_i8(r, name, dtype, shape, assimilated, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: name
    integer, intent(in) :: dtype
    integer(c_int64_t), intent(in) :: shape(:)
    logical, intent(in) :: assimilated
    integer, intent(out) :: ierr
    integer(c_int64_t) :: cshape(max(1, size(shape)))
    integer :: k, n
    n = size(shape)
    do k = 1, n
      cshape(k) = shape(n + 1 - k)  ! C order: the last Fortran dimension varies slowest
    end do
    ierr = c_add_field(r%ptr, cstr(name), int(dtype, c_int), int(n, c_int), cshape, merge(1_c_int, 0_c_int, assimilated))
  end subroutine add_field_i8

  subroutine add_field_i4(r, name, dtype, shape, assimilated, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: name
    integer, intent(in) :: dtype
    integer(c_int32_t), intent(in) :: shape(:)
    logical, intent(in) :: assimilated
    integer, intent(out) :: ierr
    call add_field_i8(r, name, dtype, int(shape, c_int64_t), assimilated, ierr)
  end subroutine add_field_i4

  !> This process's elements [offset, offset + count) of the flattened field (MPI runners; 0-based offset).
  subroutine enkflow_set_slice(r, name, offset, count, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: name
    integer(c_int64_t), intent(in) :: offset, count
    integer, intent(out) :: ierr
    ierr = c_set_slice(r%ptr, cstr(name), offset, count)
  end subroutine enkflow_set_slice

  !> An MPI model's collectives (before init): rank (0-based) of size runner processes, and c_funloc of two
  !> bind(c) functions of the caller, as enkflow_runner_set_comm in C:
  !>   integer(c_int) function bcast(buf, nbytes, ctx) bind(c)      ! rank 0's nbytes bytes at buf to all ranks
  !>     type(c_ptr), value :: buf, ctx;  integer(c_size_t), value :: nbytes
  !>   integer(c_int) function allreduce_max(value, ctx) bind(c)    ! the maximum of value over the ranks
  !>     integer(c_int), intent(inout) :: value;  type(c_ptr), value :: ctx
  !> each returning 0 on success; ctx is passed back to them unchanged.
  subroutine enkflow_set_comm(r, rank, size, bcast, allreduce_max, ctx, ierr)
    type(enkflow_runner), intent(in) :: r
    integer, intent(in) :: rank, size
    type(c_funptr), intent(in) :: bcast, allreduce_max
    type(c_ptr), intent(in) :: ctx
    integer, intent(out) :: ierr
    ierr = c_set_comm(r%ptr, int(rank, c_int), int(size, c_int), bcast, allreduce_max, ctx)
  end subroutine enkflow_set_comm

  !> Join the server (HELLO); it checks the fields.
  subroutine enkflow_init(r, ierr)
    type(enkflow_runner), intent(in) :: r
    integer, intent(out) :: ierr
    ierr = c_init(r%ptr)
  end subroutine enkflow_init

  ! The bind dummies are not CONTIGUOUS: for a strided section the compiler would pass a temporary copy,
  ! freed on return, whose address the library would keep and write into at every expose. Refused.
  logical function contiguous_ok(r, name, contiguous, n, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: name
    logical, intent(in) :: contiguous
    integer(c_int64_t), intent(in) :: n
    integer, intent(out) :: ierr
    contiguous_ok = contiguous .or. n <= 1
    ierr = ENKFLOW_OK
    if (.not. contiguous_ok) ierr = c_set_error(r%ptr, int(ENKFLOW_EINVAL, c_int), cstr("field '" // trim(name) // &
      "': the array bound is not contiguous (a strided section?); the library writes into it in place, bind a " // &
      "contiguous array"))
  end function contiguous_ok

  subroutine bind_r4(r, name, x, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: name
    real(c_float), dimension(..), intent(inout), target :: x
    integer, intent(out) :: ierr
    if (.not. contiguous_ok(r, name, is_contiguous(x), size(x, kind=c_int64_t), ierr)) return
    ierr = c_bind(r%ptr, cstr(name), int(ENKFLOW_FLOAT32, c_int), c_loc(x), size(x, kind=c_int64_t))
  end subroutine bind_r4

  subroutine bind_r8(r, name, x, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: name
    real(c_double), dimension(..), intent(inout), target :: x
    integer, intent(out) :: ierr
    if (.not. contiguous_ok(r, name, is_contiguous(x), size(x, kind=c_int64_t), ierr)) return
    ierr = c_bind(r%ptr, cstr(name), int(ENKFLOW_FLOAT64, c_int), c_loc(x), size(x, kind=c_int64_t))
  end subroutine bind_r8

  subroutine bind_i4(r, name, x, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: name
    integer(c_int32_t), dimension(..), intent(inout), target :: x
    integer, intent(out) :: ierr
    if (.not. contiguous_ok(r, name, is_contiguous(x), size(x, kind=c_int64_t), ierr)) return
    ierr = c_bind(r%ptr, cstr(name), int(ENKFLOW_INT32, c_int), c_loc(x), size(x, kind=c_int64_t))
  end subroutine bind_i4

  subroutine bind_i8(r, name, x, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: name
    integer(c_int64_t), dimension(..), intent(inout), target :: x
    integer, intent(out) :: ierr
    if (.not. contiguous_ok(r, name, is_contiguous(x), size(x, kind=c_int64_t), ierr)) return
    ierr = c_bind(r%ptr, cstr(name), int(ENKFLOW_INT64, c_int), c_loc(x), size(x, kind=c_int64_t))
  end subroutine bind_i8

  !> Send the forecast of the member held (none the first time), receive the next member into the bound
  !> arrays; nsteps = the model steps to run, 0 when the study is over.
  subroutine enkflow_expose(r, nsteps, ierr)
    type(enkflow_runner), intent(in) :: r
    integer(c_int64_t), intent(out) :: nsteps
    integer, intent(out) :: ierr
    ierr = c_expose(r%ptr, nsteps)
  end subroutine enkflow_expose

  !> Report that the model failed on the member held; the server gives it to another runner.
  subroutine enkflow_fail(r, error, ierr)
    type(enkflow_runner), intent(in) :: r
    character(len=*), intent(in) :: error
    integer, intent(out) :: ierr
    ierr = c_fail(r%ptr, cstr(error))
  end subroutine enkflow_fail

  !> Leave the study (BYE) and free the runner.
  subroutine enkflow_finalize(r, ierr)
    type(enkflow_runner), intent(inout) :: r
    integer, intent(out) :: ierr
    ierr = c_finalize(r%ptr)
    r%ptr = c_null_ptr
  end subroutine enkflow_finalize

  !> The detail of the runner's last error ('' after a success).
  function enkflow_errmsg(r) result(msg)
    type(enkflow_runner), intent(in) :: r
    character(len=:), allocatable :: msg
    msg = fstr(c_errmsg(r%ptr))
  end function enkflow_errmsg

  !> The generic text of an error code.
  function enkflow_strerror(code) result(msg)
    integer, intent(in) :: code
    character(len=:), allocatable :: msg
    msg = fstr(c_strerror(int(code, c_int)))
  end function enkflow_strerror

  integer(c_int64_t) function enkflow_member(r)
    type(enkflow_runner), intent(in) :: r
    enkflow_member = c_member(r%ptr)
  end function enkflow_member

  integer(c_int64_t) function enkflow_cycle(r)
    type(enkflow_runner), intent(in) :: r
    enkflow_cycle = c_cycle(r%ptr)
  end function enkflow_cycle

  integer(c_int64_t) function enkflow_nsteps(r)
    type(enkflow_runner), intent(in) :: r
    enkflow_nsteps = c_nsteps(r%ptr)
  end function enkflow_nsteps

  ! --- the output service's client (enkflow_output.h) ------------------------------------------------

  !> Connect to the output service at address ({output_address}) with the token in token_file
  !> ({output_token_file}); timeout_s: the wait for its welcome (default 30 s).
  subroutine enkflow_output_open(o, address, token_file, ierr, timeout_s)
    type(enkflow_output), intent(out) :: o
    character(len=*), intent(in) :: address, token_file
    integer, intent(out) :: ierr
    real(8), intent(in), optional :: timeout_s
    real(c_double) :: t
    t = 0
    if (present(timeout_s)) t = timeout_s
    ierr = c_out_open(o%ptr, cstr(address), cstr(token_file), t)
  end subroutine enkflow_output_open

  !> The same from the service's directory (its address and token files).
  subroutine enkflow_output_open_dir(o, directory, ierr, timeout_s)
    type(enkflow_output), intent(out) :: o
    character(len=*), intent(in) :: directory
    integer, intent(out) :: ierr
    real(8), intent(in), optional :: timeout_s
    real(c_double) :: t
    t = 0
    if (present(timeout_s)) t = timeout_s
    ierr = c_out_open_dir(o%ptr, cstr(directory), t)
  end subroutine enkflow_output_open_dir

  !> The longest silence of the service (s) before ENKFLOW_ELOST (default 600).
  subroutine enkflow_output_set_timeout(o, timeout_s, ierr)
    type(enkflow_output), intent(in) :: o
    real(8), intent(in) :: timeout_s
    integer, intent(out) :: ierr
    ierr = c_out_set_timeout(o%ptr, real(timeout_s, c_double))
  end subroutine enkflow_output_set_timeout

  ! The array is copied before add returns, so a section is fine (the compiler passes a contiguous copy).
  ! Shapes and start are in Fortran order; the field's dims (C order, slowest first) are reversed.
  subroutine output_add(o, name, dtype, p, shp, time, member, start, ierr)
    type(enkflow_output), intent(in) :: o
    character(len=*), intent(in) :: name
    integer, intent(in) :: dtype
    type(c_ptr), intent(in) :: p
    integer(c_int64_t), intent(in) :: shp(:)
    real(8), intent(in) :: time
    integer, intent(in), optional :: member
    integer, intent(in), optional :: start(:)
    integer, intent(out) :: ierr
    integer(c_int64_t) :: cshape(max(1, size(shp)))
    integer(c_int64_t), target :: region(max(2, 2 * size(shp)))
    integer(c_int64_t) :: m
    integer :: k, n
    type(c_ptr) :: reg
    n = size(shp)
    m = 0
    if (present(member)) m = member
    reg = c_null_ptr
    do k = 1, n
      cshape(k) = shp(n + 1 - k)
    end do
    if (present(start)) then
      if (size(start) /= n) then
        ierr = c_out_set_error(o%ptr, int(ENKFLOW_ESIZE, c_int), cstr("output field " // trim(name) // &
          ": start has another number of entries than the array has dimensions"))
        return
      end if
      do k = 1, n
        region(2 * k - 1) = start(n + 1 - k) - 1
        region(2 * k) = start(n + 1 - k) - 1 + cshape(k)
      end do
      reg = c_loc(region)
    end if
    ierr = c_out_add(o%ptr, cstr(name), int(dtype, c_int), p, int(n, c_int), cshape, real(time, c_double), m, reg)
  end subroutine output_add

  !> Add x (real(4), any rank) as field name at time; member: 1..members of an ensemble field (absent: none);
  !> start: the 1-based index in the field of x's first element, per Fortran dimension (absent: x is the
  !> whole field).
  subroutine output_add_r4(o, name, x, time, ierr, member, start)
    type(enkflow_output), intent(in) :: o
    character(len=*), intent(in) :: name
    real(c_float), dimension(..), contiguous, intent(in), target :: x
    real(8), intent(in) :: time
    integer, intent(out) :: ierr
    integer, intent(in), optional :: member
    integer, intent(in), optional :: start(:)
    call output_add(o, name, ENKFLOW_FLOAT32, c_loc(x), shape(x, kind=c_int64_t), time, member, start, ierr)
  end subroutine output_add_r4

  subroutine output_add_r8(o, name, x, time, ierr, member, start)
    type(enkflow_output), intent(in) :: o
    character(len=*), intent(in) :: name
    real(c_double), dimension(..), contiguous, intent(in), target :: x
    real(8), intent(in) :: time
    integer, intent(out) :: ierr
    integer, intent(in), optional :: member
    integer, intent(in), optional :: start(:)
    call output_add(o, name, ENKFLOW_FLOAT64, c_loc(x), shape(x, kind=c_int64_t), time, member, start, ierr)
  end subroutine output_add_r8

  !> Wait until everything added is written; ENKFLOW_EOUTPUT: the writers failed on this client's adds.
  subroutine enkflow_output_sync(o, ierr)
    type(enkflow_output), intent(in) :: o
    integer, intent(out) :: ierr
    ierr = c_out_sync(o%ptr)
  end subroutine enkflow_output_sync

  !> Forget time (every field) before adding it again; ndropped: fields whose open pieces were dropped.
  subroutine enkflow_output_discard(o, time, ierr, ndropped)
    type(enkflow_output), intent(in) :: o
    real(8), intent(in) :: time
    integer, intent(out) :: ierr
    integer(c_int64_t), intent(out), optional :: ndropped
    integer(c_int64_t) :: n
    ierr = c_out_discard(o%ptr, real(time, c_double), n)
    if (present(ndropped)) ndropped = n
  end subroutine enkflow_output_discard

  !> The fields the last discard dropped, comma-separated.
  function enkflow_output_dropped(o) result(s)
    type(enkflow_output), intent(in) :: o
    character(len=:), allocatable :: s
    s = fstr(c_out_dropped(o%ptr))
  end function enkflow_output_dropped

  !> Goodbye; wait (default .true.): first wait until everything is written. o stays for errmsg and stats.
  subroutine enkflow_output_close(o, ierr, wait)
    type(enkflow_output), intent(in) :: o
    integer, intent(out) :: ierr
    logical, intent(in), optional :: wait
    integer(c_int) :: w
    w = 1
    if (present(wait)) w = merge(1_c_int, 0_c_int, wait)
    ierr = c_out_close(o%ptr, w)
  end subroutine enkflow_output_close

  subroutine enkflow_output_free(o)
    type(enkflow_output), intent(inout) :: o
    call c_out_free(o%ptr)
    o%ptr = c_null_ptr
  end subroutine enkflow_output_free

  function enkflow_output_errmsg(o) result(msg)
    type(enkflow_output), intent(in) :: o
    character(len=:), allocatable :: msg
    msg = fstr(c_out_errmsg(o%ptr))
  end function enkflow_output_errmsg

  subroutine enkflow_output_get_stats(o, stats, ierr)
    type(enkflow_output), intent(in) :: o
    type(enkflow_output_stats), intent(out) :: stats
    integer, intent(out) :: ierr
    ierr = c_out_get_stats(o%ptr, stats)
  end subroutine enkflow_output_get_stats

  !> The service's own figures at the last sync or close, as JSON.
  function enkflow_output_service_stats(o) result(s)
    type(enkflow_output), intent(in) :: o
    character(len=:), allocatable :: s
    s = fstr(c_out_service_stats(o%ptr))
  end function enkflow_output_service_stats

  integer(c_int64_t) function enkflow_output_members(o)
    type(enkflow_output), intent(in) :: o
    enkflow_output_members = c_out_members(o%ptr)
  end function enkflow_output_members

end module enkflow_runner_mod
