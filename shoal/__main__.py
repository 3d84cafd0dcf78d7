from shoal.cli import main

main()
