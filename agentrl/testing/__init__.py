"""agentrl's public testing API: fakes of the external edges only, shipped for users' tests (docs/testing.md).

    scripted          ScriptedEngine (replies given as text), hermes_call, single_hunk_edit
    simulated         SimulatedEngine, SimulatedPool, SimulatedEnv, number_replies (modelled costs, for scale tests)
    sandbox_attacks   the attacks a hostile policy runs against a sandbox's control plane, as reusable checks
    scripted_attacks  the one list of attacks a hostile policy writes in its replies (grader, workspace, sandbox,
                      tool-call JSON), for scripted rollouts: the rollout attack test, the chaos tier and benchmark
    models            make_tiny_model, load_embedded_tokenizer (tiny real checkpoints)

The stand-in SGLang / vLLM servers are `agentrl engine serve` (agentrl.engine.standin.sglang,
agentrl.engine.standin.vllm).
The project's own scaffolding (fake Kubernetes API and kubelet, fault-injecting servers, the chaos harness) lives
under tests/.
"""
