"""CPU stand-ins for the inference servers agentrl's HTTP engines talk to, and the loaders of those servers' own
request contracts. Not engines: servers over the `LocalEngine`, run by `agentrl engine serve [--api sglang|vllm]`
and by tests and benchmarks in-process.

    core              `StandInCore` (state, in-flight table, aborts, resume gate, weight labels, request log),
                      `StandInServer` (the TCP server), `serve_face` (behind `agentrl engine serve`)
    sglang            `StandIn`: the SGLang 0.5.23 native-API face
    vllm              `VLLMStandIn`: the vLLM 0.33.0 /v1/completions + dev-control face
    server_contract   `ServerContract`: finding a server's contract sources without importing the package, and
                      fetching them once (`python -m agentrl.engine.standin.<x>_contract fetch`)
    sglang_contract   SGLang's own `/generate` contract (`GenerateValidator`)
    vllm_contract     vLLM's own `CompletionRequest` + `SamplingParams` checks (`CompletionValidator`)
    lora_contract     both servers' own LoRA / weight-version control request models (`ControlValidator`)

Nothing outside this package imports it except the CLI, tests and benchmarks; the engines never do.
"""
