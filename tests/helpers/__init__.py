"""Support code shared by every test directory (unit, e2e, benchmarks): polling and loopback ports."""
