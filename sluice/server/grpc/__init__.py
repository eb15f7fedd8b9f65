"""sluice's gRPC API (``sluice.v1.Inference``, ``grpc.health.v1.Health``, reflection), served
by ``GrpcServer`` beside HTTP when ``server.grpc_port`` is set. Needs the ``grpc`` extra;
the messages and stubs are generated from ``sluice/v1/inference.proto`` by the build."""
