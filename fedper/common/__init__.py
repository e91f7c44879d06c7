"""What the server and a device share, without torch: the protocol, the manifest, the weights
codec, the training settings, the aggregation, the errors and atomic writes. An import-linter
contract forbids torch, ExecuTorch and matplotlib here (``pyproject.toml``): the aggregation
server is installed without them (``pip install 'fedper[server]'``)."""
