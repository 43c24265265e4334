"""The values the config fields allow, by name: run options, gradient formats, all-reduce backends, PS
protocols and the sync methods of a plan override (one tuple each, which the rest of Parallax imports)."""

RUN_OPTIONS = ("PS", "MPI", "HYBRID", "AUTO")
NO_COMPRESSION, FP16, BF16, COMPRESSION_AUTO = "none", "fp16", "bf16", "auto"
#: The 16-bit formats gradients may travel in (parallax/comm/compression.py).
COMPRESSED_FORMATS = (FP16, BF16)
#: ``CommunicationConfig.compression``'s values.
COMPRESSIONS = (NO_COMPRESSION, *COMPRESSED_FORMATS, COMPRESSION_AUTO)
#: Horovod's compressor classes (``hvd.Compression.none``, ``hvd.Compression.fp16``), taken for their names.
_HOROVOD_COMPRESSORS = {"NoneCompressor": NO_COMPRESSION, "FP16Compressor": FP16}
PS_PROTOCOLS = ("grpc", "grpc+verbs", "grpc+gdr", "grpc+mpi")

#: The all-reduce backends, by name: the one list (:mod:`parallax.comm.registry` maps each to its class).
BACKENDS = ("mpi", "collective", "horovod")
#: What ``MPIConfig.backend`` takes: a backend, or ``auto`` (mpi on CPUs, collective on GPUs).
ALLREDUCE_BACKENDS = ("auto", *BACKENDS)

#: The sync methods a plan override may ask for (``Config.plan_overrides``, ``parallax plan --override``).
OVERRIDE_SYNC = ("allreduce", "allgather", "ps")
