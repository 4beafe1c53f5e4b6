"""The one place where protobuf messages and the domain types of ``garrison.model`` meet.

Used by the controller's RPC layer, the node agent's link and the CLI; imports no program."""
