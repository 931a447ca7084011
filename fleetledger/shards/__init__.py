"""The shard contract: what the fleet may ask of an engine, how its actor is made and
named, and how its processes are reaped. Below both the controller and the engines, so
neither reaches into the other."""
