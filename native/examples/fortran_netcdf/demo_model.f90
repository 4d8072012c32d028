! A plain netCDF model in Fortran that knows nothing of enkflow: the demo model's dynamics
! (enkflow.models.demo_model), bit for bit.
!
!     fortran_netcdf_model RESTART --forcing FORCING --length HOURS [--cycle N] [--var NAME]
!
! Same behaviour as the C example (native/examples/c_netcdf/demo_model.c): reads the state and
! land_i/land_j of RESTART with nf90_get_var, the forcing pattern(lat, lon) of FORCING, advances
! round(HOURS) one-hour steps from hour (N - 1) * HOURS, and writes the state back in place with
! nf90_put_var. The netCDF Fortran API calls the C library underneath (nf90_get_var of an array is
! nc_get_vara_double), so `python -m enkflow.online.intercept` serves it unchanged.
!
! The arithmetic is the Python model's, operation by operation and in its order; parentheses keep
! the compiler from reordering it, and -ffp-contract=off from fusing it.
program fortran_netcdf_model
  use netcdf
  implicit none
  real(8), parameter :: advection = 0.2d0, diffusion = 0.05d0, forcing = 0.01d0
  real(8), parameter :: period_hours = 24.0d0, dt = 1.0d0, pi = 3.141592653589793d0
  character(len=4096) :: restart, forcing_file, arg
  character(len=256) :: var
  real(8) :: length, start_hour, t, f, tend, uc, uw
  integer :: ncycle, nsteps, a, nargs, ncid, vid, nx, ny, np, i, j, p, k, iw, ie
  real(8), allocatable :: x(:), u(:, :), un(:, :), pat(:, :)
  integer, allocatable :: li(:), lj(:)
  logical, allocatable :: land(:, :)

  restart = ''
  forcing_file = ''
  var = 'soil_moisture'
  length = -1.0d0
  ncycle = 1
  nargs = command_argument_count()
  a = 1
  do while (a <= nargs)
    call get_command_argument(a, arg)
    if (arg == '--forcing' .and. a < nargs) then
      a = a + 1
      call get_command_argument(a, forcing_file)
    else if (arg == '--length' .and. a < nargs) then
      a = a + 1
      call get_command_argument(a, arg)
      read (arg, *) length
    else if (arg == '--cycle' .and. a < nargs) then
      a = a + 1
      call get_command_argument(a, arg)
      read (arg, *) ncycle
    else if (arg == '--var' .and. a < nargs) then
      a = a + 1
      call get_command_argument(a, var)
    else if (arg(1:1) /= '-' .and. restart == '') then
      restart = arg
    else
      call usage()
    end if
    a = a + 1
  end do
  if (restart == '' .or. forcing_file == '' .or. .not. length > 0.0d0 .or. ncycle < 1) call usage()

  call check(nf90_open(trim(restart), nf90_nowrite, ncid), 'nf90_open', restart)
  nx = dimlen(ncid, 'lon', restart)
  ny = dimlen(ncid, 'lat', restart)
  np = dimlen(ncid, 'land', restart)
  allocate (x(np), li(np), lj(np), u(nx, ny), un(nx, ny), pat(nx, ny), land(nx, ny))
  call check(nf90_inq_varid(ncid, trim(var), vid), trim(var), restart)
  call check(nf90_get_var(ncid, vid, x), trim(var), restart)
  call check(nf90_inq_varid(ncid, 'land_i', vid), 'land_i', restart)
  call check(nf90_get_var(ncid, vid, li), 'land_i', restart)
  call check(nf90_inq_varid(ncid, 'land_j', vid), 'land_j', restart)
  call check(nf90_get_var(ncid, vid, lj), 'land_j', restart)
  call check(nf90_close(ncid), 'nf90_close', restart)

  call check(nf90_open(trim(forcing_file), nf90_nowrite, ncid), 'nf90_open', forcing_file)
  if (dimlen(ncid, 'lon', forcing_file) /= nx .or. dimlen(ncid, 'lat', forcing_file) /= ny) then
    write (0, '(a)') 'fortran_netcdf_model: '//trim(forcing_file)//' is not on the grid of '//trim(restart)
    stop 1
  end if
  call check(nf90_inq_varid(ncid, 'pattern', vid), 'pattern', forcing_file)
  call check(nf90_get_var(ncid, vid, pat), 'pattern', forcing_file)
  call check(nf90_close(ncid), 'nf90_close', forcing_file)

  land = .false.
  u = 0.0d0
  do p = 1, np
    if (x(p) /= x(p) .or. abs(x(p)) > huge(x(p))) then
      write (0, '(a)') 'fortran_netcdf_model: '//trim(restart)//': '//trim(var)//' holds NaN or Inf'
      stop 1
    end if
    land(li(p) + 1, lj(p) + 1) = .true.
    u(li(p) + 1, lj(p) + 1) = x(p)
  end do
  nsteps = max(1, nint_even(length / dt))
  start_hour = dble(ncycle - 1) * length
  do k = 0, nsteps - 1
    t = start_hour + dble(k) * dt
    f = forcing * sin(((2.0d0 * pi) * t) / period_hours)
    do j = 1, ny
      do i = 1, nx
        iw = modulo(i - 2, nx) + 1
        ie = modulo(i, nx) + 1
        if (.not. land(i, j)) then
          un(i, j) = 0.0d0
          cycle
        end if
        uc = u(i, j)
        uw = uc
        if (land(iw, j)) uw = u(iw, j)
        tend = -advection * (uc - uw)
        ! neighbours in the Python model's order: south (j-1), north (j+1), west, east
        tend = tend + diffusion * merge(u(i, max(j - 1, 1)) - uc, 0.0d0, j > 1 .and. land(i, max(j - 1, 1)))
        tend = tend + diffusion * merge(u(i, min(j + 1, ny)) - uc, 0.0d0, j < ny .and. land(i, min(j + 1, ny)))
        tend = tend + diffusion * merge(u(iw, j) - uc, 0.0d0, land(iw, j))
        tend = tend + diffusion * merge(u(ie, j) - uc, 0.0d0, land(ie, j))
        tend = tend + f * pat(i, j)
        un(i, j) = uc + dt * tend
      end do
    end do
    u = un
  end do
  do p = 1, np
    x(p) = u(li(p) + 1, lj(p) + 1)
  end do

  call check(nf90_open(trim(restart), nf90_write, ncid), 'nf90_open for writing', restart)
  call check(nf90_inq_varid(ncid, trim(var), vid), trim(var), restart)
  call check(nf90_put_var(ncid, vid, x), trim(var), restart)
  call check(nf90_close(ncid), 'nf90_close', restart)

contains

  subroutine check(status, what, path)
    integer, intent(in) :: status
    character(len=*), intent(in) :: what, path
    if (status /= nf90_noerr) then
      write (0, '(a)') 'fortran_netcdf_model: '//what//' ('//trim(path)//'): '//trim(nf90_strerror(status))
      stop 1
    end if
  end subroutine check

  integer function dimlen(ncid, name, path)
    integer, intent(in) :: ncid
    character(len=*), intent(in) :: name, path
    integer :: dim
    call check(nf90_inq_dimid(ncid, name, dim), name, path)
    call check(nf90_inquire_dimension(ncid, dim, len=dimlen), name, path)
  end function dimlen

  ! Round half to even, as Python's round().
  integer function nint_even(v)
    real(8), intent(in) :: v
    nint_even = nint(v)
    if (abs(v - aint(v)) == 0.5d0 .and. mod(nint_even, 2) /= 0) nint_even = nint_even - sign(1, nint_even)
  end function nint_even

  subroutine usage()
    write (0, '(a)') 'usage: fortran_netcdf_model RESTART --forcing FORCING --length HOURS [--cycle N] [--var NAME]'
    stop 2
  end subroutine usage

end program fortran_netcdf_model
