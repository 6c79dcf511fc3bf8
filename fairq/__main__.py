from fairq.cli import main

main()
