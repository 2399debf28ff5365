package ingest

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/internal/logsum"
)

// dropInterval is how often a reason's drops are summed up in one line.
const dropInterval = 10 * time.Second

// dropLog logs what ingest took in and will not deliver (docs/contract.md
// §2.4): the first of a reason at warn at once, and later ones as one line
// per reason per interval with their count and the last one, so that a
// storm of redeliveries does not write a line each, and no drop goes
// without a trace.
type dropLog struct{ *logsum.Log }

func newDropLog(log zerolog.Logger) *dropLog {
	return &dropLog{logsum.New(logsum.Options{
		Interval: dropInterval, KeyField: "reason", CountField: "dropped",
		First:   "taken in and not stored (further ones of this reason are summed up once per interval)",
		Summary: "taken in and not stored",
	}, log)}
}

// note records n drops of reason; id and where describe the last of them:
// its message id and destination, or for DropReplaced no id and the
// replaced groups.
func (l *dropLog) note(reason string, n int, id, where string, now time.Time) {
	l.Note(reason, n, now, func(e *zerolog.Event, p string) *zerolog.Event {
		if reason == DropReplaced {
			e = e.Str(p+"groups", where)
		} else {
			e = e.Str(p+"id", id).Str(p+"destination", where)
		}
		return e.Str(p+"why", dropWhy[reason])
	})
}

// dropWhy says, for each reason, what happened to the message.
var dropWhy = map[string]string{
	DropDuplicate: "a redelivery of a send of this id that is pending and not yet being dispatched; that send is delivered",
	DropCancelled: "its id was cancelled within the cancel window (10 min)",
	DropReplaced:  "a later message of its group (MassTransit token) replaced it",
}

// run writes the summaries as their intervals end, until stop is closed,
// and then the rest: no count is left unlogged.
func (l *dropLog) run(stop <-chan struct{}, now func() time.Time) {
	t := time.NewTicker(dropInterval / 2)
	defer t.Stop()
	for {
		select {
		case <-stop:
			l.Flush(now(), true)
			return
		case <-t.C:
			l.Flush(now(), false)
		}
	}
}
