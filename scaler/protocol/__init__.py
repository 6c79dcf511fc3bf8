"""KEDA's external scaler protocol: generated code, not edited by hand.

``externalscaler.proto`` is KEDA's own ``pkg/scalers/externalscaler/externalscaler.proto``
at kedacore/keda commit 8b4f083ca8c8c2baf8477e322bd4d16ac4dfa09a (2026-08-20), as is. The
``_pb2`` modules were generated from it with grpcio-tools 1.85.1 (protobuf 7.35.1
gencode); they need grpcio >= 1.85.1 and protobuf >= 7.35.1 at run time (pyproject.toml).
Ruff and mypy skip this folder (pyproject.toml): the code is the generator's.

To regenerate (a newer KEDA proto, or a newer grpcio-tools), from the repository root:

    .venv/bin/pip install grpcio-tools
    .venv/bin/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \\
        --grpc_python_out=. scaler/protocol/externalscaler.proto

then raise the grpcio and protobuf lower bounds in pyproject.toml to the versions the
new files name (``GRPC_GENERATED_VERSION``, ``ValidateProtobufRuntimeVersion``).
"""
