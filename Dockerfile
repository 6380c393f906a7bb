# mlaserve in a container, on the relocatable bundle:
#   make bundle                      # .bundle/: bin/, lib/ (RPATH $ORIGIN/../lib), share/mlaserve/
#   docker build -t mlaserve .       # or: podman build -t mlaserve .
#   docker run --gpus all --ipc=host -p 8000:8000 -v /models:/models mlaserve \
#       serve -m /models/DeepSeek-V3-Q4_K_M-00001-of-00009.gguf --tp 8 --host 0.0.0.0 --api-key "$KEY"
# The base image brings the CUDA runtime's user-space libraries and NCCL (libnccl2 is part of the
# nvidia/cuda runtime images); the driver comes from the host (NVIDIA Container Toolkit, --gpus).
# --ipc=host (or a large --shm-size): the workers' host collective and NCCL use /dev/shm.
# No RUN step: the image is the base plus the bundle, so that any base with glibc >= 2.36 works
# (BASE is a build argument; tests/deploy/test_container.sh builds it on a local base).
ARG BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${BASE}
COPY .bundle/ /opt/mlaserve/
ENV PATH=/opt/mlaserve/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# an unprivileged user (nobody); the model is mounted read-only
USER 65534:65534
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["/opt/mlaserve/bin/mlaserve"]
CMD ["serve", "--help"]
