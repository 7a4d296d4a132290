"""agentrl's public testing API: fakes of the external edges only, shipped for users' tests (docs/testing.md).

    scripted          ScriptedEngine (replies given as text), hermes_call, single_hunk_edit
    simulated         SimulatedEngine, SimulatedPool, SimulatedEnv, number_replies (modelled costs, for scale tests)
    sandbox_attacks   the attacks a hostile policy runs against a sandbox's control plane, as reusable checks
    models            make_tiny_model, load_embedded_tokenizer (tiny real checkpoints)

The stand-in SGLang / vLLM servers are `agentrl engine serve` (agentrl.engine.standin.sglang, agentrl.engine.standin.vllm).
The project's own scaffolding (fake Kubernetes API and kubelet, fault-injecting servers) lives under tests/.
"""
