"""Stored responses of the Responses API: owned by the gateway (the state store), so a
chain continues from any ingress replica."""
