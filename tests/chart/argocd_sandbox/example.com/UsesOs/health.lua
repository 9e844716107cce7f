-- Argo CD's safe os (time and date) is reachable only through require("os"): no global os.
return {status = "Healthy", message = "the time is " .. os.time()}
