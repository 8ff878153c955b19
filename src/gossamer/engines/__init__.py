"""Engines: where the worker rows live and how the communication operators reach them.

``sim`` holds all n rows in one process (communication is tensor ops). Both engines count what a
real network would carry in the same :class:`~gossamer.engines.comm.CommStats`.
"""
