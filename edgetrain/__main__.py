from edgetrain.controller.cli import main

main()
