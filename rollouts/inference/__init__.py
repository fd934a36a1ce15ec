"""The inference servers a worker runs its policy on, each an OpenAI-compatible server in a process of its
own behind one interface (inference_server): vLLM (vllm_server, started through vllm_entry, with the
plugin vllm_plugin in each of its processes) and CTranslate2 on processors without bf16 units (ct2_server,
ct2_entry, ct2_engine, ct2_openai), picked per processor by a measured probe (cpu_probe); a step's LoRA
adapter folded into the base weights where a server cannot load it side by side (merge), and the adapters a
serving worker keeps ready, least recently used first out (adapter_cache).

Pure: never imports Django, the apps, or the sandbox (rollouts reach these servers through the sandbox's
proxy, which the worker points at them).
"""
