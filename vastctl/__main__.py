from vastctl.cli import main

main()
