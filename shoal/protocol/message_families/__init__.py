"""The wire messages, one module per family. Import them from
:mod:`shoal.protocol.messages`, which gathers them into the tagged union and holds
``PROTOCOL_VERSION``: a message added here must also be added to ``AnyMessage`` there.
"""
