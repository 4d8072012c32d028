! enkflow_bind's checks in the Fortran module, without a server (tests/native/test_native_fortran_fields.py).
! A non-contiguous array section must be refused: the compiler would pass a temporary copy, whose
! address the library would keep and write into after it is freed. One line per bind: "NAME IERR MESSAGE".
program bind_checks
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use enkflow_runner_mod
  implicit none
  real(8), target :: x(10), y(4, 6), z(0)
  real(4), target :: f(3, 3)
  integer(8), target :: n(8)
  integer :: ierr
  type(enkflow_runner) :: r

  call enkflow_create(r, 'tcp://127.0.0.1:9', 'token', ierr)
  call enkflow_add_field(r, 'x', ENKFLOW_FLOAT64, [5], .true., ierr)
  call enkflow_add_field(r, 'y', ENKFLOW_FLOAT64, [2, 6], .true., ierr)
  call enkflow_add_field(r, 'f', ENKFLOW_FLOAT32, [3], .true., ierr)
  call enkflow_add_field(r, 'n', ENKFLOW_INT64, [4], .false., ierr)
  call enkflow_add_field(r, 'z', ENKFLOW_FLOAT64, [0], .false., ierr)
  call enkflow_add_field(r, 'one', ENKFLOW_FLOAT64, [1], .false., ierr)
  call enkflow_bind(r, 'x', x(1:10:2), ierr)
  call say('strided')
  call enkflow_bind(r, 'y', y(1:2, :), ierr)
  call say('rows_of_2d')
  call enkflow_bind(r, 'f', f(2, :), ierr)
  call say('row_of_real4')
  call enkflow_bind(r, 'n', n(1:8:2), ierr)
  call say('strided_int64')
  call enkflow_bind(r, 'x', x(3:7), ierr)
  call say('contiguous_section')
  call enkflow_bind(r, 'y', y(:, 2:4), ierr)
  call say('contiguous_columns')
  call enkflow_bind(r, 'z', z, ierr)
  call say('zero_size')
  call enkflow_bind(r, 'one', x(4:4:3), ierr)
  call say('one_element')
  call enkflow_finalize(r, ierr)

contains

  subroutine say(what)
    character(len=*), intent(in) :: what
    write (*, '(a, 1x, i0, 1x, a)') what, ierr, enkflow_errmsg(r)
  end subroutine say

end program bind_checks
