"""Per-node exporter: NVML and engine /metrics in, one normalized /metrics out."""
