"""`vastctl demo`: a day of the control loop against the simulated market, on virtual time, in seconds.

  setting   what a simulated day is: its options, the demand curve, the config it runs with, its clock's start
  day       the day itself: cron's minute, minute by minute on a VirtualClock, and what it returns
  calls     the day's proofs as the proof router's calls, and the proof waits measured from them
  figures   the day's figures: the lower bounds, detection latencies, the summary `demo --json` prints
  chart     the day on one page (matplotlib)
  keep      `demo --keep`: the day's state file kept for the ordinary commands and serve
"""
