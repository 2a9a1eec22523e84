"""A simulated GPU backend: Ollama (v0.30+ "e3" or v0.12.11-v0.29 "e2") or llama-server, on virtual GPUs.

It serves the real APIs (shapes, defaults, error strings from facts/ollama.md and llama-server.md) over a
catalog of real models (true hyper-parameters, weight sizes and, where the project ships the vocabulary, real
tokenizers), and reproduces the failures kvgate exists to prevent: reload thrash on a different num_ctx,
out-of-memory loads, silent prompt truncation, unbounded waits beyond num_parallel, runtime OOM when other
processes take the GPU, and llama-server's unified-pool "Context size has been exceeded.".

    start_sim(SimConfig(...)) -> (runner, url)        runner.py; ``kvgate sim`` uses add_sim_arguments / run_sim_forever
    run_workload(url, ...) -> RunReport               workload/workload.py; render_comparison in workload_report.py
    GET /sim/metrics                                  gpu/exporter.py: the virtual GPU as nvidia_gpu_exporter text,
                                                      how a gateway reads it (vram = "<url>/sim/metrics")
    GET /sim/gpu, /sim/stats; POST/DELETE /sim/processes   admin_routes.py

The simulator stands alone: it imports nothing of the gateway but its GGUF and tokenizer readers, and its memory
model (gpu/kv_cache.py) is written from the runtimes' behaviour, not from gateway.memory, so the two check each
other (tests/kvsim/test_kv_crosscheck.py).

Packages: shared at the top (config, app, runner, state, stats, clock, failures, wire, admin_routes; the models:
catalog, modelspec, vocab, templates); gpu/ (vgpu, weights, kv_cache, load_cost, exporter); ollama/ (scheduler,
loaded, load_plan, options, generation, ollama_service, prompting, ollama_routes, ollama_models, ollama_requests,
host_check, gojson, godur, go_templates) with ollama/compat/ (its OpenAI, Responses and Anthropic routes);
llama_server/ (llama_engine, llama_requests, llama_routes, llama_formats, llama_info); workload/ (workload,
workload_report, demo).
"""

from kvsim.config import SimConfig
from kvsim.runner import add_sim_arguments, run_sim_forever, sim_config_from_args, start_sim

__all__ = ["SimConfig", "add_sim_arguments", "run_sim_forever", "sim_config_from_args", "start_sim"]
