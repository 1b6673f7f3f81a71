"""The emulated Pi 4 cluster and the tools that measure edgetrain on it (README.md beside this file)."""
