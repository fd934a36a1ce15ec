from artweb.cli import main

main()
