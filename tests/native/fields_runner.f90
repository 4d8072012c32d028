! A Fortran runner for tests/native/test_native_fortran_fields.py, built against the installed
! enkflow_runner_mod: four fields of four types and three ranks, bound as they are (assumed rank),
!   a(4, 5)        real(8)     assimilated   (the server's shape (5, 4))
!   b(2, 3, 4)     real(4)     assimilated   (4, 3, 2)
!   age(6)         integer(4)  carried
!   stamp(2, 2)    integer(8)  carried
! and a model whose every update depends on the element's Fortran indices, so that a transposed layout
! shows. Usage: fields_runner ADDRESS TOKEN
program fields_runner
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use enkflow_runner_mod
  implicit none
  real(8), target :: a(4, 5)
  real(4), target :: b(2, 3, 4)
  integer(4), target :: age(6)
  integer(8), target :: stamp(2, 2)
  character(len=256) :: address, token
  integer :: ierr, i, j, k
  integer(c_int64_t) :: nsteps, m, c, s
  type(enkflow_runner) :: r

  call get_command_argument(1, address)
  call get_command_argument(2, token)
  call enkflow_create(r, trim(address), trim(token), ierr)
  call check('create')
  call enkflow_set_timeouts(r, 20d0, 5d0, ierr)
  call enkflow_add_field(r, 'a', ENKFLOW_FLOAT64, shape(a), .true., ierr)
  call check('add a')
  call enkflow_add_field(r, 'b', ENKFLOW_FLOAT32, shape(b, kind=c_int64_t), .true., ierr)
  call check('add b')
  call enkflow_add_field(r, 'age', ENKFLOW_INT32, shape(age), .false., ierr)
  call check('add age')
  call enkflow_add_field(r, 'stamp', ENKFLOW_INT64, shape(stamp), .false., ierr)
  call check('add stamp')
  call enkflow_init(r, ierr)
  call check('init')
  call enkflow_bind(r, 'a', a, ierr)
  call check('bind a')
  call enkflow_bind(r, 'b', b, ierr)
  call check('bind b')
  call enkflow_bind(r, 'age', age, ierr)
  call check('bind age')
  call enkflow_bind(r, 'stamp', stamp, ierr)
  call check('bind stamp')
  call enkflow_expose(r, nsteps, ierr)
  call check('expose')
  do while (nsteps > 0)
    m = enkflow_member(r)
    c = enkflow_cycle(r)
    do s = 1, nsteps
      do j = 1, 5
        do i = 1, 4
          a(i, j) = a(i, j) + (0.5d0 * i + j) * real(c, 8)
        end do
      end do
      do k = 1, 4
        do j = 1, 3
          do i = 1, 2
            b(i, j, k) = b(i, j, k) * 0.5 + real(i + 10 * j + 100 * k, 4)
          end do
        end do
      end do
      age = age + 1
      do j = 1, 2
        do i = 1, 2
          stamp(i, j) = stamp(i, j) + m * 1000 + c * 100 + 10 * i + j
        end do
      end do
    end do
    call enkflow_expose(r, nsteps, ierr)
    call check('expose')
  end do
  call enkflow_finalize(r, ierr)

contains

  subroutine check(what)
    character(len=*), intent(in) :: what
    if (ierr /= ENKFLOW_OK) then
      write (0, '(a)') 'fields_runner: ' // what // ': ' // enkflow_strerror(ierr) // ': ' // enkflow_errmsg(r)
      stop 1
    end if
  end subroutine check

end program fields_runner
