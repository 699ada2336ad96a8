"""vastctl: keep a fleet of rented vast.ai GPU provers the right size, cheaply, and never lose one."""

__version__ = "0.1.0"
