"""Device and host health: the readers (NVML, npu-smi, the host) and the monitor that samples them off the step path."""
