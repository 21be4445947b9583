from alignflow.cli import main

main()
