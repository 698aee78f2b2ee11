"""Planning: grid files into work units and shards (no Ray, no models loaded)."""
