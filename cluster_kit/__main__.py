from cluster_kit.cli import main

main()
