"""The shared ledger: several kvgate replicas admitting into the same backends' KV pools through one Redis."""
