"""PJRT runtime: compile and execute StableHLO (CPU by default), validate inputs."""
