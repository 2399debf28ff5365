package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Paused destinations (storage.Pauser): POST /api/v1/destinations/{name}/pause
// and …/resume, and GET /api/v1/destinations. {name} is a queue, or, with
// the query parameter exchange=X, a routing key of exchange X.

// DestinationJSON is one destination in the answers of the pause endpoints.
type DestinationJSON struct {
	DestJSON
	Paused bool       `json:"paused"`
	Since  *time.Time `json:"paused_since,omitempty"`
	By     string     `json:"paused_by,omitempty"`
	// Changed, in the answer of pause and resume: false when the
	// destination was paused (resumed) already.
	Changed *bool `json:"changed,omitempty"`
}

// DestinationsJSON is the answer of GET /api/v1/destinations: the paused
// destinations, ordered by exchange, then name.
type DestinationsJSON struct {
	Destinations []DestinationJSON `json:"destinations"`
}

type pauseBody struct {
	By string `json:"by"`
}

func (h *handler) routePauses() {
	h.mux.HandleFunc("GET /api/v1/destinations", h.destinations)
	h.mux.HandleFunc("POST /api/v1/destinations/{name}/pause", h.pause)
	h.mux.HandleFunc("POST /api/v1/destinations/{name}/resume", h.resume)
}

func destinationJSON(d wire.Destination) DestinationJSON {
	return DestinationJSON{DestJSON: NewDestJSON(d)}
}

// pathDestination reads {name} and the exchange parameter.
func pathDestination(w http.ResponseWriter, r *http.Request) (wire.Destination, bool) {
	q := r.URL.Query()
	for k := range q {
		if k != "exchange" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown parameter %q: pause and resume take exchange only", k))
			return wire.Destination{}, false
		}
	}
	d := wire.Destination{Exchange: q.Get("exchange"), Key: r.PathValue("name")}
	if d.Exchange == "amq.default" {
		writeError(w, http.StatusBadRequest, "amq.default is the default exchange, whose destinations are queues: leave exchange out")
		return d, false
	}
	if err := d.Validate("destination"); err != nil {
		writeError(w, http.StatusBadRequest, "invalid destination: "+err.Error())
		return d, false
	}
	return d, true
}

func (h *handler) pause(w http.ResponseWriter, r *http.Request) { h.setPaused(w, r, true) }

func (h *handler) resume(w http.ResponseWriter, r *http.Request) { h.setPaused(w, r, false) }

// setPaused pauses or resumes the request's destination and answers its
// state.
func (h *handler) setPaused(w http.ResponseWriter, r *http.Request, pause bool) {
	d, ok := pathDestination(w, r)
	if !ok {
		return
	}
	var body pauseBody
	if pause && r.ContentLength != 0 {
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil && !errors.Is(err, io.EOF) {
			writeError(w, http.StatusBadRequest, `bad request body (want nothing, or {"by": "<who pauses>"}): `+err.Error())
			return
		}
	}
	op := "resume"
	var changed bool
	var err error
	if pause {
		op = "pause"
		changed, err = h.opts.Store.Pause(r.Context(), d, body.By)
	} else {
		changed, err = h.opts.Store.Resume(r.Context(), d)
	}
	if err != nil {
		h.storeError(w, op, "", err)
		return
	}
	if !pause {
		// Its rows may be overdue: look at once.
		h.opts.Wake(h.opts.Now())
	}
	h.opts.Logger.Info().Str("op", op).Str("destination", d.String()).Str("by", body.By).Bool("changed", changed).
		Msg("admin API: destination " + op + "d")
	out := destinationJSON(d)
	out.Changed = &changed
	if pause {
		ps, err := h.opts.Store.Paused(r.Context())
		if err != nil {
			h.storeError(w, op, "", err)
			return
		}
		for _, pd := range ps {
			if pd.Destination == d {
				out = pausedJSON(pd)
				out.Changed = &changed
			}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func pausedJSON(p storage.PausedDestination) DestinationJSON {
	j := destinationJSON(p.Destination)
	j.Paused, j.Since, j.By = true, utc(p.Since), p.By
	return j
}

// destinations lists the paused destinations.
func (h *handler) destinations(w http.ResponseWriter, r *http.Request) {
	ps, err := h.opts.Store.Paused(r.Context())
	if err != nil {
		h.storeError(w, "list destinations", "", err)
		return
	}
	out := DestinationsJSON{Destinations: make([]DestinationJSON, 0, len(ps))}
	for _, pd := range ps {
		out.Destinations = append(out.Destinations, pausedJSON(pd))
	}
	writeJSON(w, http.StatusOK, out)
}
