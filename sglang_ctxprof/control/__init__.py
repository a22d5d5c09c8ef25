"""The control channel between the HTTP process and the schedulers: the wire protocol both sides
import, the scheduler-side handler, and the HTTP-side client.  Imports only ``model/``.
"""
