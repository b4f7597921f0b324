from provisioner.cli import main

main()
