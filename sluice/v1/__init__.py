"""sluice's gRPC API, version 1: ``inference.proto`` and the modules generated from it.

``inference_pb2.py``, ``inference_pb2.pyi`` and ``inference_pb2_grpc.py`` are written here
by the build (``setup.py``'s ``build_py`` runs grpcio-tools on every ``pip install`` and
wheel build) and are neither committed nor edited by hand.
"""
