"""pt2e quantization as real ``!quant.uniform`` StableHLO types (see the quantization issue)."""
