"""Benchmarks that print figures (training throughput, checkpoint cost, render time, the portal's
overhead); targets live here, never in timed tests."""
