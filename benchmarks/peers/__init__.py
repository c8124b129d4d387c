"""Drivers for the peer systems Cherami is compared with.

Each module exposes make_driver(**opts).
"""
