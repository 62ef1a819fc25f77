"""CRI runtime v1 (`runtime.v1.RuntimeService`): vendored api.proto and the stubs generated from
it. The proto is upstream's file byte for byte, its Apache-2.0 licence header included; where it
comes from is in PROVENANCE beside it."""
