"""What runs on the training's tensors and devices: bit sums and reductions compiled for the device, bit flips for
drills, the optimizer's step, the hardware readers' record types."""
