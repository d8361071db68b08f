from clusterctl.cli.app import main

main()
