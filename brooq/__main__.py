from brooq.cli import main

main()
