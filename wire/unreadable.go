package wire

// HeaderOriginalProperties is set on the error-queue copy of a message whose
// properties the bridge's AMQP client cannot read (docs/contract.md §4.5): the
// original content header's property flags and list, byte for byte, as a
// byte array, since its headers cannot be copied as a table.
const HeaderOriginalProperties = "x-delaybridge-original-properties"
