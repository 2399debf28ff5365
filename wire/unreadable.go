package wire

// HeaderOriginalProperties is set on the error-queue copy of a message whose
// properties the bridge's AMQP client cannot read (docs/contract.md §4.5): the
// original content header's property flags and list, byte for byte, as a
// byte array, since its headers cannot be copied as a table.
const HeaderOriginalProperties = "x-delaybridge-original-properties"

// ContentTypeUnreadable marks an error-queue copy of such a message whose
// properties did not fit a frame beside the error headers: its body is a
// 4-byte big-endian length, the original property bytes, then the original
// body.
const ContentTypeUnreadable = "application/x-delaybridge-unreadable"
