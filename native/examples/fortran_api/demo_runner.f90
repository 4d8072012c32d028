! The demo model (enkflow.models.demo_model) as a Fortran online runner over enkflow_runner_mod.
!
!   enkflow_demo_f --address ADDR --token-file FILE --grid RESTART --forcing FORCING.nc --length HOURS
!                  [--curve-key KEY] [--variable NAME]
!
! The same floating-point operations in the same order as DemoModel.advance (explicit parentheses), on the
! whole grid u(lon, lat) -- the memory layout of the Python model's (lat, lon) array -- so a forecast is
! bitwise the Python model's. The forcing pattern comes from FORCING.nc (native/examples/demo_forcing.py).
program enkflow_demo_f
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use netcdf
  use enkflow_runner_mod
  implicit none

  real(8), parameter :: DT_HOURS = 1.0d0, ADVECTION = 0.2d0, DIFFUSION = 0.05d0, FORCING = 0.01d0, &
                        PERIOD_HOURS = 24.0d0, PI = 3.141592653589793d0
  character(len=4096) :: address = '', token_file = '', restart = '', forcing_file = '', curve = '', &
                         variable = 'soil_moisture', arg, val
  character(len=:), allocatable :: token, msg
  real(8) :: length = 6.0d0
  integer :: nx, ny, nland, ierr, a, nargs, eq
  integer, allocatable :: li(:), lj(:)
  logical, allocatable :: land(:, :)
  real(8), allocatable :: pattern(:, :), u(:, :), tend(:, :)
  real(8), allocatable, target :: x(:)
  integer(c_int64_t) :: nsteps
  type(enkflow_runner) :: r

  nargs = command_argument_count()
  a = 1
  do while (a <= nargs)
    call get_command_argument(a, arg)
    eq = index(arg, '=')
    if (eq > 0) then
      val = arg(eq + 1:)
      arg = arg(:eq - 1)
    else
      if (a == nargs) call usage()
      a = a + 1
      call get_command_argument(a, val)
    end if
    select case (trim(arg))
    case ('--address'); address = val
    case ('--token-file'); token_file = val
    case ('--grid'); restart = val
    case ('--forcing'); forcing_file = val
    case ('--length'); read (val, *, iostat=ierr) length
      if (ierr /= 0) call usage()
    case ('--curve-key'); curve = val
    case ('--variable'); variable = val
    case default; call usage()
    end select
    a = a + 1
  end do
  if (len_trim(address) == 0 .or. len_trim(token_file) == 0 .or. len_trim(restart) == 0 .or. &
      len_trim(forcing_file) == 0 .or. .not. length > 0) call usage()

  call read_grid()
  allocate(u(nx, ny), tend(nx, ny), x(nland))
  x = 0

  call enkflow_read_token_file(trim(token_file), token, ierr, msg)
  if (ierr /= ENKFLOW_OK) then
    write (0, '(a)') 'enkflow_demo_f: ' // msg
    stop 1
  end if
  call enkflow_create(r, trim(address), token, ierr)
  if (ierr == ENKFLOW_OK) call enkflow_set_curve_key(r, trim(curve), ierr)
  if (ierr == ENKFLOW_OK) call enkflow_add_field(r, trim(variable), ENKFLOW_FLOAT64, [nland], .true., ierr)
  if (ierr == ENKFLOW_OK) call enkflow_init(r, ierr)
  if (ierr == ENKFLOW_OK) write (0, '(a, i0, a)') 'enkflow_demo_f: shared memory with ', enkflow_shm_ranks(r), &
                                                 ' server rank(s)'
  if (ierr == ENKFLOW_OK) call enkflow_bind(r, trim(variable), x, ierr)
  if (ierr == ENKFLOW_OK) call enkflow_expose(r, nsteps, ierr)
  do while (ierr == ENKFLOW_OK .and. nsteps > 0)
    call forecast(nsteps, real(enkflow_cycle(r) - 1, 8) * length)
    call enkflow_expose(r, nsteps, ierr)
  end do
  if (ierr /= ENKFLOW_OK) write (0, '(a, i0, a)') 'enkflow_demo_f: error ', ierr, ': ' // enkflow_errmsg(r)
  a = ierr
  call enkflow_finalize(r, ierr)
  if (a /= ENKFLOW_OK) stop 1

contains

  subroutine usage()
    write (0, '(a)') 'usage: enkflow_demo_f --address ADDR --token-file FILE --grid RESTART --forcing FORCING.nc ' // &
                     '--length HOURS [--curve-key KEY] [--variable NAME]'
    stop 2
  end subroutine usage

  subroutine check(status, what)
    integer, intent(in) :: status
    character(len=*), intent(in) :: what
    if (status /= nf90_noerr) then
      write (0, '(a)') 'enkflow_demo_f: ' // what // ': ' // trim(nf90_strerror(status))
      stop 1
    end if
  end subroutine check

  subroutine read_grid()
    integer :: nc, dim, var, xtype, k, fx, fy
    call check(nf90_open(trim(restart), nf90_nowrite, nc), trim(restart))
    call check(nf90_inq_dimid(nc, 'lon', dim), 'lon')
    call check(nf90_inquire_dimension(nc, dim, len=nx), 'lon')
    call check(nf90_inq_dimid(nc, 'lat', dim), 'lat')
    call check(nf90_inquire_dimension(nc, dim, len=ny), 'lat')
    call check(nf90_inq_dimid(nc, 'land', dim), 'land')
    call check(nf90_inquire_dimension(nc, dim, len=nland), 'land')
    allocate(li(nland), lj(nland), land(nx, ny), pattern(nx, ny))
    call check(nf90_inq_varid(nc, 'land_i', var), 'land_i')
    call check(nf90_get_var(nc, var, li), 'land_i')
    call check(nf90_inq_varid(nc, 'land_j', var), 'land_j')
    call check(nf90_get_var(nc, var, lj), 'land_j')
    call check(nf90_inq_varid(nc, trim(variable), var), trim(variable))
    call check(nf90_inquire_variable(nc, var, xtype=xtype), trim(variable))
    call check(nf90_close(nc), trim(restart))
    if (xtype /= nf90_double) then
      write (0, '(a)') 'enkflow_demo_f: ' // trim(restart) // ': ' // trim(variable) // ' is not double (this example ' // &
                       'runs float64 states)'
      stop 1
    end if
    land = .false.
    do k = 1, nland
      if (li(k) < 0 .or. li(k) >= nx .or. lj(k) < 0 .or. lj(k) >= ny) then
        write (0, '(a, i0, a)') 'enkflow_demo_f: land point ', k - 1, ' outside the grid'
        stop 1
      end if
      land(li(k) + 1, lj(k) + 1) = .true.
    end do
    call check(nf90_open(trim(forcing_file), nf90_nowrite, nc), trim(forcing_file))
    call check(nf90_inq_dimid(nc, 'lon', dim), 'lon')
    call check(nf90_inquire_dimension(nc, dim, len=fx), 'lon')
    call check(nf90_inq_dimid(nc, 'lat', dim), 'lat')
    call check(nf90_inquire_dimension(nc, dim, len=fy), 'lat')
    if (fx /= nx .or. fy /= ny) then
      write (0, '(a)') 'enkflow_demo_f: ' // trim(forcing_file) // ' is for another grid than ' // trim(restart)
      stop 1
    end if
    call check(nf90_inq_varid(nc, 'pattern', var), 'pattern')
    call check(nf90_get_var(nc, var, pattern), 'pattern')
    call check(nf90_close(nc), trim(forcing_file))
  end subroutine read_grid

  ! DemoModel(length = nsteps h, start_hour).advance on the land points x.
  subroutine forecast(nsteps, start_hour)
    integer(c_int64_t), intent(in) :: nsteps
    real(8), intent(in) :: start_hour
    integer(c_int64_t) :: k
    integer :: i, j, iw, ie, p
    real(8) :: t, c, uc, uw, tt, d
    u = 0.0d0
    do p = 1, nland
      u(li(p) + 1, lj(p) + 1) = x(p)
    end do
    do k = 0, nsteps - 1
      t = start_hour + real(k, 8) * DT_HOURS
      c = FORCING * sin(((2.0d0 * PI) * t) / PERIOD_HOURS)
      do j = 1, ny
        do i = 1, nx
          iw = modulo(i - 2, nx) + 1
          ie = modulo(i, nx) + 1
          uc = u(i, j)
          uw = uc
          if (land(iw, j)) uw = u(iw, j)
          tt = (-ADVECTION) * (uc - uw)
          ! The neighbours in DemoModel's order: south (roll +1 along lat), north, west, east.
          d = 0.0d0
          if (j > 1) then
            if (land(i, j - 1) .and. land(i, j)) d = u(i, j - 1) - uc
          end if
          tt = tt + DIFFUSION * d
          d = 0.0d0
          if (j < ny) then
            if (land(i, j + 1) .and. land(i, j)) d = u(i, j + 1) - uc
          end if
          tt = tt + DIFFUSION * d
          d = 0.0d0
          if (land(iw, j) .and. land(i, j)) d = u(iw, j) - uc
          tt = tt + DIFFUSION * d
          d = 0.0d0
          if (land(ie, j) .and. land(i, j)) d = u(ie, j) - uc
          tt = tt + DIFFUSION * d
          tend(i, j) = tt + c * pattern(i, j)
        end do
      end do
      where (land)
        u = u + DT_HOURS * tend
      elsewhere
        u = 0.0d0
      end where
    end do
    do p = 1, nland
      x(p) = u(li(p) + 1, lj(p) + 1)
    end do
  end subroutine forecast

end program enkflow_demo_f
