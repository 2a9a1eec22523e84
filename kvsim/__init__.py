"""A simulated GPU backend: Ollama (v0.30+ "e3" or v0.12.11-v0.29 "e2") or llama-server, on virtual GPUs.

It serves the real APIs (shapes, defaults, error strings from facts/ollama.md and llama-server.md) over a
catalog of real models (true hyper-parameters, weight sizes and, where the project ships the vocabulary, real
tokenizers), and reproduces the failures kvgate exists to prevent: reload thrash on a different num_ctx,
out-of-memory loads, silent prompt truncation, unbounded waits beyond num_parallel, runtime OOM when other
processes take the GPU, and llama-server's unified-pool "Context size has been exceeded.".

    start_sim(SimConfig(...)) -> (runner, url)        runner.py; ``kvgate sim`` uses add_sim_arguments / run_sim_forever
    run_workload(url, ...) -> RunReport               workload.py; render_comparison in workload_report.py
    HttpSimVramSource / SimVramSource                 vram.py: the virtual GPU as a gateway.memory VramSource
    GET /sim/gpu, /sim/stats; POST/DELETE /sim/processes   admin_routes.py

Module map: config (SimConfig), catalog + modelspec + weights (models), vocab + templates + prompting
(tokens), vgpu + load_cost + load_plan (memory), scheduler + loaded + generation + ollama_service (Ollama's
engine), ollama_routes + ollama_models + openai_routes + host_check (Ollama's HTTP API), llama_engine +
llama_routes + llama_info (llama-server mode), clock (simulated time), failures (error strings).
"""

from kvsim.config import SimConfig
from kvsim.runner import add_sim_arguments, run_sim_forever, sim_config_from_args, start_sim

__all__ = ["SimConfig", "add_sim_arguments", "run_sim_forever", "sim_config_from_args", "start_sim"]
