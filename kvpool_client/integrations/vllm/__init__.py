"""kvpool in vLLM: a KV connector (``KVPoolConnector``).

Turned on with one ``--kv-transfer-config`` block::

    {"kv_connector": "KVPoolConnector",
     "kv_connector_module_path": "kvpool_client.integrations.vllm.connector",
     "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
     "kv_connector_extra_config": {"nodes": "10.0.0.5:7700"}}

The modules here other than :mod:`.connector` do not import vLLM: they hold the logic
(settings, block bytes, the scheduler's and the worker's plans) and are tested alone.
"""
