"""The lab's tools (lab/) on data and processes made here, without the testbed or a Docker engine."""
