"""Stubs generated from core/engineapi/engine.proto by `make proto` (grpcio-tools); do not edit."""
