package bridge

import (
	"github.com/delaybridge/delaybridge/ingest"
	"github.com/delaybridge/delaybridge/protocol/nsbnative"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// nsbNative is what DELAYBRIDGE_NSB_NATIVE_DELAYS adds (docs/contract.md
// §2.9): a source per delay-level queue of the NServiceBus transport's v2
// and v1 chains; their delivery exchanges, where the bridge forwards, pass
// the allow-list; and their level queues are no destination (a forward there
// would come straight back).
func nsbNative(on bool) (srcs []ingest.Source, exchanges, reserved []string) {
	if !on {
		return nil, nil, nil
	}
	chains := []nsbdelay.Chain{nsbdelay.V2, nsbdelay.V1}
	for _, c := range chains {
		exchanges = append(exchanges, c.Delivery)
		for k := range nsbdelay.Levels {
			reserved = append(reserved, c.Level(k))
		}
	}
	return nsbnative.Sources(chains...), exchanges, reserved
}
