"""The device side: emulated (or real Linux) devices, the fleet runner, in-process simulation."""
