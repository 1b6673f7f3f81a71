"""The testbed's tests (lab.testbed): provisioning, containers, faults and the benches."""
