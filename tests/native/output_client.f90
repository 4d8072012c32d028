! The data set of test_native_output.py (the C client's "fields" mode) written from Fortran arrays through
! enkflow_runner_mod: the output fields are declared (y, x) and (z, y, x) in C order, so the Fortran arrays
! are t(x, y) and q(x, y, z), and a part is given by the 1-based index of its first element (start).
! Usage: output_client_f SERVICE_DIR. Prints three refused adds ("NAME RC MESSAGE") and "stats ADDS BYTES";
! exit status 1 on an error.
program output_client_f
  use, intrinsic :: iso_c_binding
  use enkflow_runner_mod
  implicit none
  integer, parameter :: nx = 5, ny = 4, nz = 3
  type(enkflow_output) :: o
  type(enkflow_output_stats) :: st
  character(len=4096) :: dir
  real(8), target :: t(nx, ny), p(nx)
  real(4), target :: q(nx, ny, nz)
  real(8) :: times(2) = [0d0, 6d0]
  integer :: ierr, ti, m, i, j, k

  call get_command_argument(1, dir)
  call enkflow_output_open_dir(o, trim(dir), ierr, timeout_s=10d0)
  call check('open')
  do ti = 0, 1
    do m = 1, 3
      do i = 0, ny - 1
        do j = 0, nx - 1
          t(j + 1, i + 1) = real(1000 * m + 100 * ti + 10 * i + j, 8) / 3d0
        end do
      end do
      ! the rows y = 2, 3 first (a contiguous section), then y = 0, 1
      call enkflow_output_add(o, 't', t(:, 3:4), times(ti + 1), ierr, member=m, start=[1, 3])
      call check('add t')
      call enkflow_output_add(o, 't', t(:, 1:2), times(ti + 1), ierr, member=m, start=[1, 1])
      call check('add t')
      do k = 0, nz - 1
        do i = 0, ny - 1
          do j = 0, nx - 1
            q(j + 1, i + 1, k + 1) = real(m * 7 + k * 5 + i * 3 + j + ti, 4) / 7.0
          end do
        end do
      end do
      call enkflow_output_add(o, 'q', q, times(ti + 1), ierr, member=m)
      call check('add q')
    end do
    do j = 0, nx - 1
      if (ti == 0) then
        p(j + 1) = real(10 * ti + j, 8) / 3d0
      else
        p(j + 1) = real(10 * ti + j, 8)
      end if
    end do
    call enkflow_output_add(o, 'p', p(1:3), times(ti + 1), ierr, start=[1])
    call check('add p')
    call enkflow_output_add(o, 'p', p(4:5), times(ti + 1), ierr, start=[4])
    call check('add p')
  end do
  ! Refused before sending (the module's own check, then the library's): printed, not fatal.
  call enkflow_output_add(o, 't', t, 0d0, ierr, member=1, start=[1])
  write (*, '(a, i0, 1x, a)') 'start_size ', ierr, enkflow_output_errmsg(o)
  call enkflow_output_add(o, 't', t(:, 1:2), 0d0, ierr, member=1, start=[1, 4])
  write (*, '(a, i0, 1x, a)') 'start_outside ', ierr, enkflow_output_errmsg(o)
  call enkflow_output_add(o, 'salinity', t, 0d0, ierr, member=1)
  write (*, '(a, i0, 1x, a)') 'unknown_field ', ierr, enkflow_output_errmsg(o)
  call enkflow_output_close(o, ierr)
  call check('close')
  call enkflow_output_get_stats(o, st, ierr)
  write (*, '(a, i0, 1x, i0)') 'stats ', st%adds, st%bytes
  call enkflow_output_free(o)

contains

  subroutine check(what)
    character(len=*), intent(in) :: what
    if (ierr /= ENKFLOW_OK) then
      write (0, '(a, a, i0, a, a, a, a)') what, ': ', ierr, ' ', enkflow_strerror(ierr), ': ', enkflow_output_errmsg(o)
      call enkflow_output_free(o)
      stop 1
    end if
  end subroutine check

end program output_client_f
